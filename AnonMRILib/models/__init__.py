"""Neural networks (plain torch.nn.Modules with config dataclasses); import the submodules."""

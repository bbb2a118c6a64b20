"""Draw the AnonMRI icon (128 x 128 PNG): a head in profile whose brain is kept and whose face is
remodeled (a mosaic). Writes ``AnonMRI/Resources/Icons/AnonMRI.png`` and the extension icon
``AnonMRI.png`` at the repository root.

    python AnonMRI/Resources/Icons/make_icons.py
"""
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

SIZE = 128
SCALE = 4  # drawn at 4x and downsampled: anti-aliased edges
HERE = Path(__file__).resolve().parent
OUTPUTS = (HERE / "AnonMRI.png", HERE.parents[2] / "AnonMRI.png")


def head_profile(s: float):
    """Polygon of a head facing right (x right, y down) in a 128-unit box, scaled by ``s``."""
    angles = np.deg2rad(np.linspace(215.0, 20.0, 60))  # back of the head, over the top, to the forehead
    skull = [(56 + 38 * np.cos(a), 56 - 40 * np.sin(a)) for a in angles]
    face = [(93, 50), (91, 56), (100, 66), (92, 70), (94, 75), (91, 78), (93, 81), (90, 90), (80, 95), (76, 100)]
    points = [(36, 118), (38, 96)] + skull + face + [(74, 118)]
    return [(x * s, y * s) for x, y in points]


def draw_icon() -> Image.Image:
    s = SCALE
    canvas = Image.new("RGBA", (SIZE * s, SIZE * s), (0, 0, 0, 0))
    draw = ImageDraw.Draw(canvas)
    draw.rounded_rectangle([2 * s, 2 * s, 126 * s, 126 * s], radius=22 * s, fill=(28, 52, 86, 255))

    silhouette = Image.new("L", canvas.size, 0)
    ImageDraw.Draw(silhouette).polygon(head_profile(s), fill=255)
    head = np.array(silhouette) > 0

    rgba = np.array(canvas)
    rgba[head] = (222, 230, 238, 255)
    # the remodeled face: a two-tone teal mosaic in front of x = 70
    yy, xx = np.mgrid[0:canvas.size[1], 0:canvas.size[0]]
    front = head & (xx > 74 * s)
    blocks = ((xx // (7 * s)) + (yy // (7 * s))) % 2 == 0
    rgba[front & blocks] = (32, 178, 170, 255)
    rgba[front & ~blocks] = (94, 214, 200, 255)
    canvas = Image.fromarray(rgba)
    draw = ImageDraw.Draw(canvas)
    # the kept brain, with a few gyri
    box = [26 * s, 24 * s, 80 * s, 68 * s]
    draw.ellipse(box, fill=(236, 150, 150, 255), outline=(176, 84, 96, 255), width=2 * s)
    for offset in (0, 10, 20):
        draw.arc([(32 + offset) * s, 30 * s, (52 + offset) * s, 50 * s], 200, 340,
                 fill=(176, 84, 96, 255), width=2 * s)
    draw.arc([34 * s, 44 * s, 72 * s, 62 * s], 20, 160, fill=(176, 84, 96, 255), width=2 * s)
    return canvas.resize((SIZE, SIZE), Image.LANCZOS)


def main() -> None:
    icon = draw_icon()
    for path in OUTPUTS:
        icon.save(path, format="PNG", optimize=True)
        print(path)


if __name__ == "__main__":
    main()

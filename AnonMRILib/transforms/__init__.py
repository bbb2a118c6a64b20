"""Transforms: brain mask, privacy transform (surface, convex hull, pooling), model grid."""

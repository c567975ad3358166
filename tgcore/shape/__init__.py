"""Shape layer: symbolic integer expressions (symbolic.py), strided views (view.py) and ShapeTrackers."""

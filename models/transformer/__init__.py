"""The Transformer models (the original's mesh_tensorflow.transformer package)."""

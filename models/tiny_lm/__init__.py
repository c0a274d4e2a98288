"""A tiny Transformer language model, in mtf and in plain TF 2, with the same math.

Used by benchmarks (mesh_tf overhead against plain TF, layouts) and by the cost-model
tests. It is not the library's Transformer (models/transformer); it is a fixed, small
model both implementations can share weights with.
"""

"""A tiny Transformer language model written directly in mtf ops.

Used by the cost-model, accounting and layout-report tests and by the layouts and memory
benchmarks: a fixed, small model whose communication is easy to derive by hand. It is
not the library's Transformer (models/transformer).
"""

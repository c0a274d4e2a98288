"""A tiny Transformer language model written directly in mtf ops (not the library's
Transformer): a fixed, small model whose communication is easy to derive by hand, for
the cost-model tests and the layouts and memory benchmarks."""

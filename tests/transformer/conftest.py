"""Tests of models/transformer, in folders that mirror its packages: trainer/ (the
models.transformer.trainer package), layers/, decoding/ and data/ (the model library's
layers, decoding and input modules); the tests of transformer.py itself stay here.

The shared helpers (trainer_helpers, decode_checks, orig_fixture) live in this folder, so
it goes on sys.path for the tests of every subfolder."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

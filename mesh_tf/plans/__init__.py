"""Communication plans as data: what an op sends, computed from shapes and a MeshLayout.

Pure Python (no TensorFlow). `steps` holds the step types and `OpPlan`; `rules` computes
the plan of each op family. `lowering/plan_interpreter.py` runs plans on laid-out values,
and `analysis/cost_model.py` sums their records, so the two cannot disagree.
"""

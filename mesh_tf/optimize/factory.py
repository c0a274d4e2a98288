"""`make_optimizer`: an optimizer chosen by T2T-style hparams."""
from mesh_tf.errors import MtfError
from mesh_tf.optimize.adafactor import adafactor_optimizer_from_hparams
from mesh_tf.optimize.sgd import SgdOptimizer


def make_optimizer(hparams, lr):
  """SgdOptimizer(lr) for hparams.optimizer == "SGD", Adafactor for "Adafactor"."""
  name = getattr(hparams, "optimizer", None)
  if name == "SGD":
    return SgdOptimizer(lr)
  if name == "Adafactor":
    return adafactor_optimizer_from_hparams(hparams, lr)
  raise MtfError("unknown hparams.optimizer %r: make_optimizer knows 'SGD' and "
                 "'Adafactor'" % (name,))

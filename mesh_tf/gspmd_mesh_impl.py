"""`mtf.gspmd_mesh_impl`: the GSPMD backend's module path (`GSPMDMeshImpl`)."""
from mesh_tf.backends.gspmd import GSPMDMeshImpl, LaidOutTensor, LaidOutVariable
from mesh_tf.backends.gspmd_sharding import (annotate, dims_mapping, make_device_mesh,
                                             sharding_proto)

"""Reading XLA HLO text in tests: sharding annotations, parameters and collectives.

A sharding is checked by what it means, not by how XLA prints it: `device_blocks` says,
for each device, which block of the tensor it holds (block index and block count per
tensor axis), and `expected_blocks` computes the same from mtf layout semantics
(processor coordinates on the mesh).
"""
import re

import numpy as np

_SHARDING_CALL = re.compile(
    r'custom_call_target="Sharding", sharding=\{([^}]*)\}.*?op_name="([^"]*)"')
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*?) ([a-z][\w\-]*)\((.*)$")
_COLLECTIVE = re.compile(
    r"^\s*(?:ROOT )?%[\w.\-]+ = (\S+(?: \S+)*?) (all-reduce|all-gather|collective-permute|"
    r"all-to-all|reduce-scatter)(?:-start)?\(")
_ARRAY_TYPE = re.compile(r"([a-z]+\d*)\[([\d,]*)\]")
_DTYPE_BYTES = {"f32": 4, "s32": 4, "u32": 4, "pred": 1, "f16": 2, "bf16": 2, "f64": 8,
                "s64": 8, "u8": 1, "s8": 1}


def parse_sharding(text):
  """(tile dims, device list, replicate_last_dim) of an HLO sharding's text."""
  text = text.strip()
  if text == "replicated":
    return None
  match = re.match(r"devices=\[([\d,]+)\](\S+)(.*)", text)
  assert match, "unexpected sharding text %r" % text
  tiles = [int(t) for t in match.group(1).split(",")]
  devices_text = match.group(2)
  if devices_text.startswith("<="):  # iota form: <=[dims] or <=[dims]T(perm)
    iota = re.match(r"<=\[([\d,]+)\](?:T\(([\d,]+)\))?", devices_text)
    dims = [int(d) for d in iota.group(1).split(",")]
    devices = np.arange(int(np.prod(dims))).reshape(dims)
    if iota.group(2):
      devices = devices.transpose([int(p) for p in iota.group(2).split(",")])
    devices = devices.reshape(-1).tolist()
  else:
    devices = [int(d) for d in devices_text.split(",")]
  return tiles, devices, "last_tile_dim_replicate" in match.group(3)


def device_blocks(sharding_text, rank, num_devices):
  """{device: ((block index per axis), (blocks per axis))} of a sharding text."""
  parsed = parse_sharding(sharding_text)
  if parsed is None:
    return {d: ((0,) * rank, (1,) * rank) for d in range(num_devices)}
  tiles, devices, replicate_last = parsed
  assert len(tiles) == rank + (1 if replicate_last else 0), (sharding_text, rank)
  out = {}
  for position, device in enumerate(devices):
    index = np.unravel_index(position, tiles)
    out[device] = (tuple(int(i) for i in index[:rank]), tuple(tiles[:rank]))
  return out


def expected_blocks(dim_names, rules, mesh_sizes, device_of_pnum=None):
  """What each device should hold of a tensor with these dims under mtf layout rules.

  Args:
    dim_names: the tensor's dimension names, in order.
    rules: {tensor dim name: mesh axis}.
    mesh_sizes: e.g. [2, 4].
    device_of_pnum: the logical-to-physical map (default: identity).
  """
  n = int(np.prod(mesh_sizes))
  device_of_pnum = device_of_pnum or list(range(n))
  out = {}
  for pnum in range(n):
    coords = np.unravel_index(pnum, mesh_sizes)
    index = tuple(int(coords[rules[d]]) if d in rules else 0 for d in dim_names)
    count = tuple(mesh_sizes[rules[d]] if d in rules else 1 for d in dim_names)
    out[device_of_pnum[pnum]] = (index, count)
  return out


def shardings_by_op_name(hlo_text):
  """{op_name of each XlaSharding custom-call: its sharding text}."""
  return {name: sharding for sharding, name in _SHARDING_CALL.findall(hlo_text)}


def instructions(hlo_text):
  """[(name, type text, opcode, rest of line)] of the ENTRY computation."""
  entry = hlo_text[hlo_text.index("\nENTRY"):]
  out = []
  for line in entry.splitlines()[1:]:
    match = _INSTRUCTION.match(line)
    if match:
      out.append(match.groups())
  return out


def unannotated_parameters(hlo_text):
  """Names of ENTRY parameters from which no path of reshapes/copies reaches a Sharding."""
  instrs = instructions(hlo_text)
  users = {}
  for name, _, opcode, rest in instrs:
    operands = re.findall(r"%([\w.\-]+)", rest.split("metadata=")[0])
    for o in operands:
      users.setdefault(o, []).append((name, opcode, rest))

  def reaches_sharding(name, depth=0):
    for user, opcode, rest in users.get(name, []):
      if opcode == "custom-call" and 'custom_call_target="Sharding"' in rest:
        return True
      if opcode in ("reshape", "copy", "convert", "bitcast") and depth < 4:
        if reaches_sharding(user, depth + 1):
          return True
    return False
  return [name for name, _, opcode, _ in instrs
          if opcode == "parameter" and not reaches_sharding(name)]


def collectives(hlo_text):
  """[(kind, bytes of its result)] of the collectives in a (partitioned) HLO module."""
  out = []
  for line in hlo_text.splitlines():
    match = _COLLECTIVE.match(line)
    if not match:
      continue
    size = 0
    for dtype, dims in _ARRAY_TYPE.findall(match.group(1)):
      size += int(np.prod([int(d) for d in dims.split(",") if d] or [1])) * _DTYPE_BYTES.get(
          dtype, 4)
    out.append((match.group(2), size))
  return out

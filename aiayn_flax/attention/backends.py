"""One attention, several backends: each form of equation 1 (forms.py) declares which calls it
serves, and one dispatcher picks, per call site, the one the config asks for
(`model.attention_implementation`) or, for "auto", the best that serves the call.

A call (`Call`) is what a site of the model asks when it is traced: the encoder's
self-attention, the decoder's causal self-attention, cross-attention, or a decoding step on the
cache (greedy or beam), with its dtype, head widths, lengths, whether it adds a bias, drops
attention weights out, or trains. A target (`Target`) is where the program runs: the platform,
a CUDA GPU's compute capability (which sets its shared memory per block), and the device
count; train_step.make_model writes it into the model's config.

The backends:
- written_out: equation 1 as jnp operations, every call but the decoding steps', every
  platform; the only one with attention dropout or sown weights (inference reads them for the
  attention maps), so every call at inference takes it;
- xla, cudnn: jax.nn.dot_product_attention (XLA's or cuDNN's fused kernel), training calls
  with d_k == d_v, no dropout; cuDNN on a CUDA GPU of compute capability >= 8.0, in 16-bit
  floats, heads up to 128 wide and a multiple of 8;
- pallas: Pallas's Triton flash-attention kernels, training calls on one CUDA GPU of compute
  capability >= 8.0 (interpreted on a CPU where asked for: tests), d_k == d_v, no bias, no
  dropout, in the largest block whose shared memory the GPU has (`pallas_shared_memory`);
- decoding_step, beam: a decoding step's attention on the cache's layouts (model.py), one per
  kind of step.

"auto" is pallas then written_out on a GPU, written_out elsewhere (a form becomes a default
only where a GPU has shown it equal and faster: bench/device_session.py). A requested backend
that cannot serve a training call is refused in one line naming the config field and why.
"""
import dataclasses
import functools
from typing import Callable

from aiayn_flax import devices
from aiayn_flax.attention import forms

FIELD = "model.attention_implementation"
TRAINING_SITES = ("encoder", "decoder", "cross")
DECODING_SITES = ("decoding_step", "beam")


@dataclasses.dataclass(frozen=True)
class Call:
  """What one site asks of attention, known when it is traced."""
  site: str  # "encoder", "decoder" (causal self-attention), "cross", "decoding_step", "beam"
  dtype: str  # of q, k and v
  d_k: int
  d_v: int
  queries: int
  keys: int
  training: bool = True  # False: inference (evaluation loss, decoding, attention maps)
  dropout: bool = False  # attention dropout applies (training with a rate above 0)
  bias: bool = False  # an additive bias on the logits


@dataclasses.dataclass(frozen=True)
class Target:
  """Where the traced program runs: "cpu", "gpu", "tpu", or "" (not known: a model built
  without train_step.make_model, which "auto" serves with the written-out form)."""
  platform: str = ""
  compute_capability: str = ""  # CUDA's "major.minor"; "" elsewhere (ROCm's "gfx90a" too)
  devices: int = 1

  def text(self) -> str:
    """The form a frozen model config holds."""
    return f"{self.platform}:{self.compute_capability}:{self.devices}"

  @classmethod
  def parse(cls, text: str) -> "Target":
    if not text:
      return cls()
    platform, capability, count = text.split(":")
    return cls(platform, capability, int(count))

  @property
  def capability(self) -> float:
    """The compute capability as a number, 0 where there is none."""
    major, _, minor = self.compute_capability.partition(".")
    return float(f"{major}.{minor}") if major.isdigit() and minor.isdigit() else 0.0

  @property
  def shared_memory_per_block(self) -> int:
    """Bytes a kernel's block may take (opted in), by compute capability: the CUDA C++
    Programming Guide's table of technical specifications; 0 where not known."""
    return SHARED_MEMORY_PER_BLOCK_OPTIN.get(self.compute_capability, 0)


KIB = 1024
SHARED_MEMORY_PER_BLOCK_OPTIN = {
    "7.0": 96 * KIB, "7.5": 64 * KIB, "8.0": 163 * KIB, "8.6": 99 * KIB, "8.7": 163 * KIB,
    "8.9": 99 * KIB, "9.0": 227 * KIB, "10.0": 227 * KIB, "12.0": 99 * KIB}


def target_of(device, device_count: int) -> Target:
  """The target of programs for `device`, one of `device_count`."""
  capability = str(getattr(device, "compute_capability", "")) if device.platform == "gpu" else ""
  return Target(device.platform, capability, device_count)


# Pallas's shared memory per block, measured by compiling its kernels deviceless
# (bench/attention_kernels.py; docs/records/pallas_shared_memory.json) for an H100 (compute
# capability 9.0, the most of the targets: an A100's and an L4's are below): the forward
# kernel's K and V tiles, two pipeline stages of them, are 16 bytes x block x padded head width
# in float32 and 10 in bfloat16 when a row spans several blocks (4 in one block); the backward
# kernel's, in its blocks of 32, at most 512 bytes x head width; the segment ids and the
# kernels' small buffers take less than 2 KiB besides.
def pallas_shared_memory(block: int, head: int, dtype: str, length: int) -> int:
  """Bytes of shared memory per block that Pallas's kernels ask at `block` rows, for rows of
  `length` (padded as forms.pallas_length) and heads `head` wide (padded to a power of two):
  an upper bound of what Triton asked in every kernel measured."""
  head = 1 << (head - 1).bit_length()
  length = forms.pallas_length(length)
  block = min(block, length)
  forward = (4 if block == length else 16 if dtype == "float32" else 10) * block * head
  backward = 512 * head
  return max(forward, backward) + 2048


PALLAS_BLOCKS = (128, 64, 32)


def pallas_block(call: Call, target: Target) -> tuple[int, str]:
  """(the largest block of PALLAS_BLOCKS whose shared memory the target has, "") or (0, why
  none does). Cross-attention's head is one column wider (forms.pallas)."""
  head = call.d_k + (call.site == "cross")
  length = max(call.queries, call.keys)
  if target.platform == "cpu":  # interpreted: no shared memory
    return PALLAS_BLOCKS[0], ""
  available = target.shared_memory_per_block
  if not available:
    return 0, f"the shared memory of compute capability {target.compute_capability!r} is unknown"
  for block in PALLAS_BLOCKS:
    if pallas_shared_memory(block, head, call.dtype, length) <= available:
      return block, ""
  need = pallas_shared_memory(PALLAS_BLOCKS[-1], head, call.dtype, length)
  return 0, (f"its kernels need {need:,} bytes of shared memory per block at {call.dtype}, "
             f"head {head}, length {length}; the GPU has {available:,}")


@dataclasses.dataclass(frozen=True)
class Backend:
  """A form of equation 1 and what it serves: `refuses(call, target)` is "" where it serves
  the call, else the reason; `run(q, k, v, mask, bias, call, target, module)` computes it."""
  name: str
  refuses: Callable[[Call, Target], str]
  run: Callable


def _training_only(call: Call) -> str:
  if call.site not in TRAINING_SITES:
    return f"it does not serve a {call.site} on the decoding cache"
  if not call.training:
    return "inference reads the attention weights (attention maps), which it does not give"
  if call.dropout:
    return ("it has no attention dropout (model.attention_dropout_rate=0 or "
            f"{FIELD}=written_out)")
  if call.d_k != call.d_v:
    return f"it needs d_k == d_v (model.qk_dim, model.v_dim: {call.d_k} and {call.d_v})"
  return ""


def _cuda_triton(target: Target, name: str) -> str:
  if target.platform != "gpu":
    where = target.platform or "an unknown platform"
    return f"{name} needs a CUDA GPU; this program is for {where}"
  if target.capability < 8.0:
    return (f"{name} needs compute capability 8.0 or more; this GPU's is "
            f"{target.compute_capability or 'not CUDA'}")
  return ""


def _refuses_written_out(call: Call, target: Target) -> str:
  del target
  return "" if call.site in TRAINING_SITES else f"it does not serve a {call.site}"


def _refuses_xla(call: Call, target: Target) -> str:
  del target
  return _training_only(call)


def _refuses_cudnn(call: Call, target: Target) -> str:
  why = _training_only(call) or _cuda_triton(target, "cuDNN's fused attention")
  if why:
    return why
  if call.dtype not in ("bfloat16", "float16"):
    return f"cuDNN's fused attention takes bfloat16 or float16, not {call.dtype} (model.dtype)"
  if call.d_k % 8 or call.d_k > 128:
    return f"cuDNN's fused attention takes heads up to 128 wide in multiples of 8, not {call.d_k}"
  return ""


def _refuses_pallas(call: Call, target: Target) -> str:
  why = _training_only(call)
  if not why and call.bias:
    why = "its kernels take no bias"
  if not why and target.platform != "cpu":  # a CPU interprets the kernels (tests)
    why = _cuda_triton(target, "Pallas's Triton kernels")
  if not why and target.devices > 1:
    why = (f"over {target.devices} devices XLA would gather the kernels' operands onto each "
           "device")
  return why or pallas_block(call, target)[1]


def _refuses_decoding(site: str):
  return lambda call, target: "" if call.site == site else f"it serves only a {site}"


def _run_written_out(q, k, v, mask, bias, call, target, module):
  del target
  rate = module.config.attention_dropout_rate if call.dropout else 0.0
  return forms.written_out(q, k, v, mask, bias, dropout_rate=rate,
                           deterministic=not call.dropout, module=module)


def _run_through_jax(implementation):
  def run(q, k, v, mask, bias, call, target, module):
    del call, target, module
    xla = functools.partial(forms.through_jax, bias=bias, implementation="xla")
    if implementation == "xla":
      return xla(q, k, v, mask)
    # cuDNN's on a GPU; a CPU lowering of the GPU's program (the compiled plan's FLOP count)
    # takes XLA's
    fused = functools.partial(forms.through_jax, bias=bias, implementation=implementation)
    return devices.platform_dependent(q, k, v, mask, cpu=xla, default=fused)
  return run


def _run_pallas(q, k, v, mask, bias, call, target, module):
  del module
  return forms.pallas(q, k, v, mask, bias, cross=call.site == "cross",
                      block=pallas_block(call, target)[0], interpret=target.platform == "cpu")


def _run_decoding(form):
  return lambda q, k, v, mask, bias, call, target, module: form(q, k, v, mask, bias)


BACKENDS = {b.name: b for b in [
    Backend("written_out", _refuses_written_out, _run_written_out),
    Backend("xla", _refuses_xla, _run_through_jax("xla")),
    Backend("cudnn", _refuses_cudnn, _run_through_jax("cudnn")),
    Backend("pallas", _refuses_pallas, _run_pallas),
    Backend("decoding_step", _refuses_decoding("decoding_step"),
            _run_decoding(forms.decoding_step)),
    Backend("beam", _refuses_decoding("beam"), _run_decoding(forms.beam)),
]}
# What "auto" tries in order, by platform (the first that serves a call).
AUTO = {"gpu": ("pallas", "written_out")}


def requestable() -> tuple[str, ...]:
  """The values of model.attention_implementation."""
  return ("auto", *(name for name in BACKENDS if name not in DECODING_SITES))


def choose(call: Call, requested: str, target: Target) -> str:
  """The backend that serves `call`: a decoding step's own form; at inference the written-out
  form; in training the requested backend (refused in one line where it cannot serve the
  call) or, for "auto", the first of AUTO that serves it."""
  if call.site in DECODING_SITES:
    return call.site
  if not call.training:
    return "written_out"
  if requested == "auto":
    for name in AUTO.get(target.platform, ()):
      if not BACKENDS[name].refuses(call, target):
        return name
    return "written_out"
  if requested not in BACKENDS:
    raise ValueError(f"{FIELD}={requested!r}: unknown; known: {', '.join(requestable())}")
  why = BACKENDS[requested].refuses(call, target)
  if why:
    raise ValueError(f"{FIELD}={requested} cannot serve the {call.site} attention "
                     f"({call.dtype}, head {call.d_k}, lengths {call.queries}x{call.keys}): "
                     f"{why}; {FIELD}=auto picks a form that can")
  return requested


def attend(call: Call, q, k, v, mask, bias=None, *, requested: str, target: Target, module):
  """Equation 1 for `call`, through the backend `choose` picks (layouts: forms.py)."""
  name = choose(call, requested, target)
  return BACKENDS[name].run(q, k, v, mask, bias, call, target, module)

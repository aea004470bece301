"""The versions of the software that produced a checkpoint or a score, recorded beside it: a
figure from another jax/flax/orbax/tfds/sentencepiece/sacrebleu can differ in its last digits,
and a reader should be able to tell which stack made it."""
import importlib.metadata
import platform

PACKAGES = ("aiayn_flax", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint",
            "tensorflow-datasets", "sentencepiece", "sacrebleu", "sacremoses", "numpy")


def software_versions() -> dict[str, str]:
  """{"python": "3.11.7", "jax": "0.10.2", ...}; "not installed" for a package that is not."""
  versions = {"python": platform.python_version()}
  for name in PACKAGES:
    try:
      versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      versions[name] = "not installed"
  return versions


def cpu_model() -> str:
  """The CPU's model name and its bf16 features, from /proc/cpuinfo (Linux)."""
  try:
    with open("/proc/cpuinfo") as f:
      info = f.read()
  except OSError:
    return "unknown CPU"
  fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
  fields = {k.strip(): v.strip() for k, v in fields.items()}
  features = set(fields.get("flags", "").split())
  bf16 = [f for f in ("avx512_bf16", "amx_bf16") if f in features]
  return f"{fields.get('model name', 'unknown CPU')} ({', '.join(bf16) or 'no bf16 units'})"

"""GPU kernel time per step, by kind of kernel, from a trace bench/device_check.py took.

  python bench/device_check.py --trace_dir=/tmp/trace             # on the GPU: 3 steps per size
  pip install xprof                                                # where you read the trace
  python bench/kernel_stats.py /tmp/trace/base/plugins/profile/*/*.xplane.pb --steps=3

Reads xprof's kernel_stats tool (CUPTI's record of every kernel) and prints the kernels' time
per step by kind (cuBLAS matmuls, reduction fusions, scatters, copies and transposes, other
fusions), then the kernels that take the most. The kinds are read off XLA:GPU's kernel names.
"""
import collections
import json

from absl import app, flags

flags.DEFINE_integer("steps", 3, "Steps the trace holds (bench/device_check.py traces 3).")
flags.DEFINE_integer("top", 12, "Kernels listed one by one.")
FLAGS = flags.FLAGS


def kind(name: str) -> str:
  if name.startswith(("nvjet", "sm90", "sm80", "cutlass", "ampere")) or "gemm" in name:
    return "matmuls (cuBLAS, XLA's gemm fusions)"
  if "scatter" in name:
    return "scatters"
  if "transpose" in name or "copy" in name:
    return "transposes and copies"
  if "reduce" in name:
    return "reduction fusions (softmax, layer norm, loss, sums)"
  if "fusion" in name or "convert" in name:
    return "other fusions (elementwise, converts)"
  return "other"


def kernel_rows(path: str) -> list[dict]:
  from xprof.convert import raw_to_tool_data
  data, _ = raw_to_tool_data.xspace_to_tool_data([path], "kernel_stats", {})
  table = json.loads(data)
  columns = [column["id"] for column in table["cols"]]
  return [dict(zip(columns, [cell.get("v") if cell else None for cell in row["c"]]))
          for row in table["rows"]]


def main(argv):
  if len(argv) != 2:
    raise app.UsageError("give one .xplane.pb")
  rows = kernel_rows(argv[1])
  if not rows:
    raise app.UsageError(f"{argv[1]}: no GPU kernels in this trace")
  per_step = lambda us: us / FLAGS.steps / 1e3  # noqa: E731  microseconds in all -> ms per step
  total = sum(row["total_duration_us"] for row in rows)
  launches = sum(row["occurrences"] for row in rows) / FLAGS.steps
  print(f"kernels: {per_step(total):.2f} ms per step, {launches:.0f} launches per step")
  kinds = collections.Counter()
  for row in rows:
    kinds[kind(row["kernel_name"])] += row["total_duration_us"]
  print("| kind | ms per step | share |\n|---|---:|---:|")
  for name, us in kinds.most_common():
    print(f"| {name} | {per_step(us):.2f} | {us / total:.1%} |")
  print("\n| kernel | launches per step | ms per step | share |\n|---|---:|---:|---:|")
  for row in sorted(rows, key=lambda row: -row["total_duration_us"])[:FLAGS.top]:
    print(f"| {row['kernel_name'][:60]} | {row['occurrences'] / FLAGS.steps:.0f} | "
          f"{per_step(row['total_duration_us']):.2f} | {row['total_duration_us'] / total:.1%} |")


if __name__ == "__main__":
  app.run(main)

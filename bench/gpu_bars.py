"""The bars a GPU form is held to, one source for the CPU tests and for the lent GPU's session
(bench/device_session.py): what the session checks on the device is what the tests check here."""

# A form's results against its plain form's, per dtype: relative, and a gradient's against its
# array's largest value (tests/test_attention_backends.py); bfloat16 for its own roundings of
# the terms.
TOLERANCE = {"bfloat16": 3e-2, "float32": 2e-5}
# The kernels of the quick start's training step at 343 x 8, compiled deviceless for one H100,
# when bench/gpu_census.py was last run (tests/test_gpu_step.py); another XLA may launch a few
# more: up to KERNELS_ALLOWANCE times as many.
QUICKSTART_KERNELS = 565
KERNELS_ALLOWANCE = 1.05

# The CPU plugin logs through absl to stderr; keep test output readable.
System.put_env("TF_CPP_MIN_LOG_LEVEL", System.get_env("TF_CPP_MIN_LOG_LEVEL", "3"))

ExUnit.start(exclude: [:slow])

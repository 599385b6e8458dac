# :slow tests take seconds each (run them with --include slow).
ExUnit.start(exclude: [:slow])

# :slow tests take seconds each; :known_doctest_failure marks Nx doctests
# that do not pass on EXLA.Backend yet (see test/exla/nx_doctest_test.exs).
ExUnit.start(exclude: [:slow, :known_doctest_failure])

[
  inputs: ["{mix,.formatter}.exs", "lib/**/*.{ex,exs}"],
  import_deps: [:nx]
]

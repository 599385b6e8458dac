[
  inputs: ["{mix,.formatter}.exs", "{config,lib,test,bench,examples,mix}/**/*.{ex,exs}"],
  import_deps: [:nx]
]

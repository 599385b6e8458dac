import Config

# EXLA keeps its configuration under :exla; see EXLA.Client for :clients,
# :default_client and :preferred_clients.
if config_env() == :test do
  import_config "test.exs"
end

defmodule EXLA.Platform do
  @moduledoc false
  # What EXLA knows about each platform, in one place: the platforms, the
  # device files of their drivers, the Python packages that ship their
  # plugins and where in a site-packages folder the plugin lies, the names
  # their plugins report, their PJRT create options and XLA option
  # defaults, and the libraries a CUDA plugin needs loaded before it.
  # `EXLA.Plugin` finds and loads plugins with it, `EXLA.Client` creates
  # clients with it. (The default `:clients` in mix.exs name these
  # platforms too: a test checks that they agree.)

  # :pjrt_plugin is any other PJRT plugin (EXLA 0.13's platform of that
  # name): its client names the library (:plugin_path) and the device type
  # it registers (:device_type), and EXLA assumes nothing else about it.
  @builtin [:host, :cuda, :rocm, :tpu]
  @all @builtin ++ [:pjrt_plugin]

  @typedoc "A platform EXLA knows how to run on."
  @type t :: :host | :cuda | :rocm | :tpu | :pjrt_plugin

  @doc "The platforms EXLA knows."
  @spec all() :: [t()]
  def all, do: @all

  @doc """
  The platforms whose plugins EXLA finds by itself (the platforms of the
  default `:clients`): all but `:pjrt_plugin`.
  """
  def builtin, do: @builtin

  @doc """
  The client option that names `platform`'s plugin library: `:plugin_path`
  for `:pjrt_plugin` (required, as in EXLA 0.13), else `:plugin`.
  """
  def plugin_option(:pjrt_plugin), do: :plugin_path
  def plugin_option(_platform), do: :plugin

  @doc """
  The environment variable naming `platform`'s plugin library, or nil for
  `:pjrt_plugin`, whose client names it.
  """
  def env_var(:pjrt_plugin), do: nil
  def env_var(platform), do: "EXLA_PJRT_PLUGIN_" <> String.upcase(Atom.to_string(platform))

  @doc """
  Whether QR decompositions compute f32 in f64 on `platform` (see
  `EXLA.Defn.Lowering.QR`): only on the host. A CPU computes f64 at half
  its f32 rate and EXLA 0.7.2's accurate QR was the host's; GPUs compute
  f64 at 1/2 (data-center parts) to 1/64 (consumer parts) of f32's rate,
  TPUs not at all, and there EXLA 0.7.2 computed QR in f32 too.
  """
  def qr_in_f64?(:host), do: true
  def qr_in_f64?(_platform), do: false

  @doc """
  Whether QR, eigh, SVD, Cholesky, LU, solve and the determinant (from
  4x4) run as the NIF's native kernels
  (`EXLA.Defn.Lowering.Decompositions`) on `platform`: on the host, whose
  clients' plugins get them registered when the client is made. Other
  platforms keep their lowerings (Nx's default implementations, and EXLA's
  Householder QR and LU).
  """
  def native_linalg?(:host), do: true
  def native_linalg?(_platform), do: false

  @doc """
  The device files (globs) a platform's kernel driver creates on Linux:
  without one, no plugin of that platform can find a device.
  """
  # CUDA: the NVIDIA driver; /dev/dxg is WSL2's GPU paravirtualization.
  # ROCm: AMD's compute driver (KFD). TPU VMs: accel devices (v2 to v4)
  # or VFIO groups (v5 and later).
  def device_files(:host), do: []
  def device_files(:cuda), do: ["/dev/nvidiactl", "/dev/nvidia[0-9]*", "/dev/dxg"]
  def device_files(:rocm), do: ["/dev/kfd"]
  def device_files(:tpu), do: ["/dev/accel[0-9]*", "/dev/vfio/[0-9]*"]
  def device_files(:pjrt_plugin), do: []

  @doc """
  Where a Python package puts `platform`'s plugin, relative to a
  site-packages folder (a glob), or nil for the CPU (which EXLA installs).
  """
  def plugin_glob(:host), do: nil
  def plugin_glob(:cuda), do: "jax_plugins/xla_cuda*/xla_cuda_plugin.so"
  def plugin_glob(:rocm), do: "jax_plugins/xla_rocm*/xla_rocm_plugin.so"
  def plugin_glob(:tpu), do: "libtpu/libtpu.so"
  def plugin_glob(:pjrt_plugin), do: nil

  @doc """
  How a plugin found with `plugin_glob/1` ranks: the newer version first
  (`xla_cuda13` before `xla_cuda12`, `xla_rocm7` before `xla_rocm60`, whose
  first digit is ROCm's major version). Plugins without one rank last.
  """
  def plugin_rank(path) do
    cond do
      major = cuda_major(path) -> {major, 0}
      match = Regex.run(~r{/xla_rocm(\d)(\d*)/[^/]+$}, path) -> rocm_rank(match)
      true -> {0, 0}
    end
  end

  defp rocm_rank([_, major, ""]), do: {String.to_integer(major), 0}
  defp rocm_rank([_, major, minor]), do: {String.to_integer(major), String.to_integer(minor)}

  @doc """
  The CUDA major version of a plugin installed by pip
  (`.../xla_cuda13/xla_cuda_plugin.so`), or nil.
  """
  def cuda_major(path) do
    case Regex.run(~r{/xla_cuda(\d+)/[^/]+$}, path) do
      [_, digits] -> String.to_integer(digits)
      nil -> nil
    end
  end

  @doc "What to install to get `platform`'s plugin, for messages."
  def install_hint(:host), do: "the Python package xla-cpu-pjrt (EXLA installs it by itself)"

  def install_hint(:cuda) do
    ~s|the plugin and the NVIDIA libraries with `pip install "jax[cuda13]"`, or the | <>
      "plugin alone with `pip install jax-cuda13-pjrt` where CUDA 13 is installed " <>
      "on the system (cuda12 in both names for a driver that supports CUDA 12 only)"
  end

  def install_hint(:rocm), do: "the Python package jax-rocm60-pjrt (or another jax-rocm*-pjrt)"
  def install_hint(:tpu), do: "the Python package libtpu (`pip install libtpu`)"
  def install_hint(:pjrt_plugin), do: "the plugin, and give its path as the client's :plugin_path"

  @doc """
  The names a plugin of `platform` may report as its platform name
  (lowercase); nil where any name is accepted.
  """
  def plugin_names(:host), do: ["cpu", "host"]
  def plugin_names(:cuda), do: ["cuda", "gpu"]
  def plugin_names(:rocm), do: ["rocm", "gpu"]
  def plugin_names(:tpu), do: nil
  def plugin_names(:pjrt_plugin), do: nil

  @doc "Whether a plugin's reported platform name is the CPU's."
  def cpu_name?(platform_name),
    do: String.downcase(platform_name || "") in plugin_names(:host)

  @doc """
  The PJRT create options of a client of validated `options`, where
  `host_device_count` is the device count of a `:host` client. Only values
  of the exact types each plugin expects may be given: a wrong type aborts
  the VM on some CPU plugins.
  """
  def create_options(options, host_device_count) do
    case Keyword.fetch!(options, :platform) do
      :host ->
        [{"cpu_device_count", {:int64, host_device_count}}]

      gpu when gpu in [:cuda, :rocm] ->
        [
          {"preallocate", {:bool, Keyword.fetch!(options, :preallocate)}},
          {"memory_fraction", {:float, Keyword.fetch!(options, :memory_fraction) * 1.0}}
        ]

      other when other in [:tpu, :pjrt_plugin] ->
        []
    end
  end

  @doc """
  The XLA options a platform's clients compile with unless their
  `:xla_options` say otherwise.
  """
  # See `EXLA.Client`'s `:xla_options` for why XNNPACK is off on the CPU.
  def default_xla_options(:host), do: [xla_cpu_use_xnnpack: false]
  def default_xla_options(_platform), do: []

  @doc """
  The library of the NVIDIA driver a CUDA plugin needs. It comes with the
  driver, never with a Python package.
  """
  def cuda_driver, do: "libcuda.so.1"

  @doc """
  The libraries a CUDA `major` plugin needs, in the order they are loaded
  (dependencies first), as `{folder, file, required?}`: the NVIDIA Python
  package installs `file` in `nvidia/<folder>/lib` of its site-packages
  folder (CUDA 13's packages share `nvidia/cu13/lib`). Required libraries
  are those JAX checks before it uses the plugin; the others are loaded
  when they are there.
  """
  def cuda_libraries(12) do
    [
      {"nvjitlink", "libnvJitLink.so.12", false},
      {"cuda_runtime", "libcudart.so.12", true},
      {"cuda_nvrtc", "libnvrtc.so.12", false},
      {"cublas", "libcublasLt.so.12", true},
      {"cublas", "libcublas.so.12", true},
      {"nccl", "libnccl.so.2", false},
      {"cuda_cupti", "libcupti.so.12", true},
      {"cusparse", "libcusparse.so.12", true},
      {"cusolver", "libcusolver.so.11", true},
      {"cufft", "libcufft.so.11", true},
      {"nvshmem", "libnvshmem_host.so.3", false},
      {"cudnn", "libcudnn.so.9", true}
    ]
  end

  def cuda_libraries(13) do
    [
      {"cu13", "libnvJitLink.so.13", false},
      {"cu13", "libcudart.so.13", true},
      {"cu13", "libnvrtc.so.13", false},
      {"cu13", "libcublasLt.so.13", true},
      {"cu13", "libcublas.so.13", true},
      {"nccl", "libnccl.so.2", false},
      {"cu13", "libcupti.so.13", true},
      {"cu13", "libcusparse.so.12", true},
      {"cu13", "libcusolver.so.12", true},
      {"cu13", "libcufft.so.12", true},
      {"nvshmem", "libnvshmem_host.so.3", false},
      {"cudnn", "libcudnn.so.9", true}
    ]
  end

  def cuda_libraries(_other), do: []
end

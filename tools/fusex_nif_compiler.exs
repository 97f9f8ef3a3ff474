unless Code.ensure_loaded?(Mix.Tasks.Compile.FusexNif) do
  # fusex's NIF compiler for Mix, shared by the product mix.exs and the test
  # suites' project (test/ex/mix.exs).
  defmodule Mix.Tasks.Compile.FusexNif do
    @moduledoc false
    # Builds the NIF (and, where nvcc is found, the CUDA backend) through the
    # Makefile, and makes the app's priv/ in the build path point at them so
    # that code:priv_dir(fusex) finds them.
    use Mix.Task.Compiler

    @impl true
    def run(_args) do
      root = Path.expand("..", Path.dirname(__ENV__.file))
      make = ["--no-print-directory", "-C", root]

      # Quiet where there is nothing to do, one line where there is work, the
      # make output only where it fails; as many jobs as the machine has
      # cores (the CUDA units build in parallel).
      {_, up_to_date} = System.cmd("make", make ++ ["-q", "nif"], stderr_to_stdout: true)

      if up_to_date != 0 do
        jobs = System.schedulers_online()
        Mix.shell().info("fusex: building the NIF (make -j#{jobs} nif)")
        {out, status} = System.cmd("make", make ++ ["-s", "-j#{jobs}", "nif"], stderr_to_stdout: true)

        if status != 0 do
          IO.write(out)
          Mix.raise("fusex: `make nif` failed (exit #{status}); see the output above")
        end
      end

      priv = Path.join(root, "priv")
      target = Path.join(Mix.Project.app_path(), "priv")

      unless File.exists?(Path.join(target, "fusex_nif.so")) do
        File.rm_rf!(target)
        File.mkdir_p!(Path.dirname(target))
        Mix.Utils.symlink_or_copy(priv, target)
      end

      {:ok, []}
    end
  end
end

"""fusex_jax's side of the cross-surface test (test/ex/fusex_surfaces_test.exs
runs it): each case of the file named on the command line (a Python
literal: a list of (function, positional, tensors, options), positional
and tensors as [(name, type, shape)], options as [(name, value)]) called
under jax.jit on zero arrays; one line per case on stdout: the message of
the ArgumentError it raised, or what else happened.

    PYTHONPATH=python python3 test/python/surfaces.py CASES
"""

import ast
import sys

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

import fusex_jax as fj  # noqa: E402

DTYPES = {"f32": jnp.float32, "f64": jnp.float64, "bf16": jnp.bfloat16, "f16": jnp.float16, "s32": jnp.int32,
          "s64": jnp.int64, "u8": jnp.uint8}


def outcome(fn, positional, tensors, options):
    arrays = [jnp.zeros(shape, DTYPES[t]) for _, t, shape in positional + tensors]
    names = [n for n, _, _ in tensors]
    npos = len(positional)

    def call(*xs):
        return fn(*xs[:npos], **dict(zip(names, xs[npos:])), **dict(options))

    try:
        jax.block_until_ready(jax.jit(call)(*arrays))
    except fj.ArgumentError as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - reported as what came
        return f"not an ArgumentError: {type(e).__name__}: {e}"
    return "no error"


def main():
    with open(sys.argv[1]) as f:
        cases = ast.literal_eval(f.read())
    for fun, positional, tensors, options in cases:
        print(outcome(getattr(fj, fun), positional, tensors, options).replace("\n", " "), flush=True)


if __name__ == "__main__":
    main()

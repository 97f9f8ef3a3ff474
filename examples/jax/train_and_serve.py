"""Trains a small recurrent model (two linear layers into a MinGRU, a linear
head) with fusex_jax under jax.jit and jax.grad (fusex's forward and
backward kernels as XLA custom calls), with a hand-written Adam, then
serves it frame by frame with fusex_jax.mingru_step and checks the served
frames against the model on the whole sequence.

    make example-jax      (PYTHONPATH=python, the JAX venv of make test-jax)
"""

import jax
import jax.numpy as jnp

import fusex_jax

B, L, F, H = 8, 16, 2, 8


def data(key):
    x = jax.random.uniform(key, (B, L, F), jnp.float32, -1.0, 1.0)

    def leaky(acc, d):
        acc = 0.7 * acc + d / 2
        return acc, acc

    _, y = jax.lax.scan(leaky, jnp.zeros((B,), jnp.float32), jnp.swapaxes(x[..., 0], 0, 1))
    return x, jnp.swapaxes(y, 0, 1)[..., None]


def init(key):
    kz, kc, ko = jax.random.split(key, 3)
    normal = lambda k, shape: 0.5 * jax.random.normal(k, shape, jnp.float32)
    return {"wz": normal(kz, (F, H)), "wc": normal(kc, (F, H)), "wo": normal(ko, (H, 1)), "bo": jnp.zeros((1,))}


def predict(p, x):
    h = fusex_jax.mingru(x @ p["wz"], x @ p["wc"])
    return h @ p["wo"] + p["bo"]


def loss(p, x, y):
    return jnp.mean((predict(p, x) - y) ** 2)


@jax.jit
def train_step(p, m, v, t, x, y, lr=2.0e-2, b1=0.9, b2=0.999, eps=1.0e-8):
    value, g = jax.value_and_grad(loss)(p, x, y)
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
    step = lambda p, m, v: p - lr * (m / (1 - b1**t)) / (jnp.sqrt(v / (1 - b2**t)) + eps)
    return jax.tree.map(step, p, m, v), m, v, value


@jax.jit
def serve_frame(p, state, xt):
    h, state = fusex_jax.mingru_step(state, xt @ p["wz"], xt @ p["wc"])
    return h @ p["wo"] + p["bo"], state


def main():
    kd, kp = jax.random.split(jax.random.PRNGKey(7))
    x, y = data(kd)
    p = init(kp)
    m = jax.tree.map(jnp.zeros_like, p)
    v = jax.tree.map(jnp.zeros_like, p)
    losses = []
    for t in range(1, 61):
        p, m, v, value = train_step(p, m, v, t, x, y)
        losses.append(float(value))
    print(f"training loss: {losses[0]:.4f} -> {losses[-1]:.4f} (60 Adam steps)")

    state = jnp.zeros((B, H), jnp.float32)
    frames = []
    for t in range(L):
        out, state = serve_frame(p, state, x[:, t])
        frames.append(out)
    served = jnp.stack(frames, axis=1)
    diff = float(jnp.max(jnp.abs(served - predict(p, x))))
    print(f"served frame by frame vs the whole sequence: max |diff| = {diff:g}")
    if not (losses[-1] < 0.5 * losses[0] and diff <= 1.0e-5):
        raise SystemExit("FAILED")
    print("ok")


if __name__ == "__main__":
    main()

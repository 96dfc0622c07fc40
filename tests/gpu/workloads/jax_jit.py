"""A JAX jit function (XLA)."""
import os
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import hashlib
import jax, jax.numpy as jnp
import numpy as np

@jax.jit
def step(w, x):
    h = jnp.tanh(x @ w)
    return w - 0.01 * (x.T @ h), (h ** 2).mean()

w = jnp.asarray(np.random.default_rng(0).standard_normal((256, 256), dtype=np.float32))
x = jnp.asarray(np.random.default_rng(1).standard_normal((128, 256), dtype=np.float32))
for i in range(5):
    w, loss = step(w, x)
w = np.asarray(w)
print("loss", round(float(loss), 5))
print("sha256", hashlib.sha256(w.round(4).tobytes()).hexdigest())

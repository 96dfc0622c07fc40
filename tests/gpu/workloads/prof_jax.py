"""Profiling workload (JAX): kernels long enough (>= 20 us) to compare times."""
import os
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax, jax.numpy as jnp
import numpy as np

@jax.jit
def step(w, x):
    h = jnp.tanh(x @ w)
    return w - 1e-4 * (x.T @ h), jnp.mean(h * h)

w = jnp.asarray(np.random.default_rng(0).standard_normal((2048, 2048), dtype=np.float32))
x = jnp.asarray(np.random.default_rng(1).standard_normal((4096, 2048), dtype=np.float32))
for i in range(10):
    w, loss = step(w, x)
print("loss", round(float(loss), 4))

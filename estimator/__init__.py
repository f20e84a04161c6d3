"""Deprecated name of `gpuest` (kept one release): `import estimator` gives gpuest's API, and
`estimator.X` modules are gpuest's (`estimator.memory` is `gpuest.price.memory`)."""
from gpuest import *  # noqa: F401,F403
from gpuest import __all__, __version__  # noqa: F401
from gpuest._alias import install_alias

install_alias("estimator", "gpuest", {"estimator.memory": "gpuest.price.memory"})

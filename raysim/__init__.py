"""raysim: Ray-parallel simulation of differentially private federated learning."""
__version__ = "0.1.0"

# The config parser knows only that method sections exist; the method registry supplies them (it
# discovers the method modules lazily, the first time a config section is looked up).
from raysim.algorithms import registry as _registry  # noqa: E402,F401
# The client-level mechanisms (privacy.mechanism) likewise: the registry adds the built-in ones to the
# config's choices when it is imported.
from raysim.privacy.mechanisms import registry as _mechanisms  # noqa: E402,F401

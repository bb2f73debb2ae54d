"""One way in for plugins: register a data source, model, probe or normalization layer from your
own code, and use it by name everywhere bnlab takes one (spec strings, ``bnlab train`` flags,
configs, the experiment runner).

The four decorators work alike (:func:`bnlab.spec.signature_params`): the options of what they
register are its keyword parameters — names and defaults from the signature, types from the
annotations (``int``, ``float | None``, ``Literal["a", "b"]`` for choices, ``tuple[int, ...]``)
or else from the defaults. ``params`` declare an option more precisely (a range, help text); a
declared option wins over the inferred one but must match the signature's name and default. A bad
name or option fails with a ``ValueError`` that lists the valid choices.

* :func:`source` — ``loader(*, device, seed, data_dir, verify, download, **options) ->
  DataSource`` (``bnlab.data.load(name, **options)``, ``--data NAME --data-option K=V``);
* :func:`model` — ``build(factory, input_shape, num_classes, *, **options) -> nn.Module``
  (``bnlab.models.create(name, **options)``, ``--model NAME --model-option K=V``);
* :func:`probe` — a :class:`bnlab.probes.Probe` subclass (``bnlab.probes.create("name(k=v)")``,
  ``--probe "name(k=v)"``);
* :func:`norm` — ``Layer(num_features, **options)`` (``bnlab.norms.create("name(k=v)", C)``,
  ``--norm "name(k=v)"``).

A script imports its plugin module itself. For ``bnlab`` commands (and the processes a
data-parallel run starts) name the module in ``$BNLAB_PLUGINS`` or give its package a
``bnlab.plugins`` entry point (:mod:`bnlab.spec.plugins`). ``docs/readme/plugins.md`` has a worked
example of each kind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from bnlab.data.base import source
from bnlab.models.catalog import model
from bnlab.norms.registry import norm
from bnlab.probes import PROBES
from bnlab.spec import ENTRY_POINT_GROUP, PLUGINS_ENV, Param, load_plugins, signature_params

__all__ = ["ENTRY_POINT_GROUP", "PLUGINS_ENV", "Param", "load_plugins", "model", "norm", "probe",
           "signature_params", "source"]


def probe(name: str | None = None, params: Mapping[str, Param] | None = None) -> Callable:
    """Decorator: register a :class:`bnlab.probes.Probe` subclass as probe ``name`` (default: its
    ``name`` attribute), its options read from ``__init__`` like every registry's."""
    return PROBES.register(name, params)

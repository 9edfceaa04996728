"""Operations: the ``strata`` command (``cli.py``) and what it stands on: the
configuration (``config.py``), console logging (``logs.py``), backend plugins (the
interface ``backend_spec.py``, the hooks ``hookspecs.py``, the loader ``plugins.py``),
engine builds (``build.py``) and models by path or name (``models.py``, ``hub.py``,
``catalog.py``)."""

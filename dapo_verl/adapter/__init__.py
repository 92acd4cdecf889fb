"""The only code that imports verl: thin translations between verl's objects and ``dapo_verl.core``.

Importing this package registers nothing; registration happens in :mod:`dapo_verl.adapter.register`,
which verl loads through the ``verl.plugins`` entry point on every ``import verl``.
"""

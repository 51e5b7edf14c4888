"""The node API's schema: ``kubeplane/node/v1/*.proto`` (package ``kubeplane.node.v1``).

The ``*_pb2`` modules next to them are generated at build time by ``setup.py`` (grpcio-tools)
and are not in the repository; :mod:`kubeplane.api.schema` is the code that uses them.
"""

"""``python3 -m kubeplane.dns -conf PATH`` (see :mod:`kubeplane.dns.main`)."""

import sys

from kubeplane.dns.main import main

sys.exit(main())

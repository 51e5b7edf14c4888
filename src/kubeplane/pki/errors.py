"""Exceptions raised by :mod:`kubeplane.pki` (the tree is drawn in the package docstring)."""

from __future__ import annotations


class PKIError(Exception):
    """Base class of every error the PKI library raises."""


class InvalidPEMError(PKIError):
    """Bytes handed in as a PEM certificate, key or CSR could not be parsed."""


class UnsupportedAlgorithmError(PKIError):
    """A key algorithm or key type that kubeplane does not issue or sign with."""


class InvalidRequestError(PKIError):
    """Certificate request parameters are wrong (bad IP address, unknown usage, empty name...)."""


class CAError(PKIError):
    """The CA handed in cannot sign: no private key, key does not match, or not a CA certificate."""


class InvalidCSRError(PKIError):
    """A certificate signing request whose self-signature does not verify."""

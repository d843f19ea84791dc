"""Tests of privasr.privacy.audit."""

"""Helpers shared by the test modules: daemons, clients, proxies, strategies and
fake streams. Fixtures stay in the conftest.py files, which import from here."""

"""The daemon's HTTP/1.1 side, all on one small h11 server (`server`):
Prometheus metrics (`metrics` counts, `scrape` serves) and the dashboard
(`ui`)."""

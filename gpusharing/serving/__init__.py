"""Serving and HTTP plumbing shared by the services: gunicorn with gthread workers and TLS (`server`), JSON bodies
read within bounds (`jsonbody`), a small JSON client (`jsonhttp`), certificates (`certs`), logging (`logs`) and
Prometheus across workers (`metrics`)."""

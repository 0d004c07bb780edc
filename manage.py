#!/usr/bin/env python
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings")
    if sys.argv[1:2] == ["serve_demo"]:
        # The demo's stdio servers start now, beside Django's setup, rather than after it (1.5-2 s): the first call
        # finds them ready. The upstream pool adopts them (registry/upstreams/prestart.py).
        from handoff.management.demo_servers import demo_servers_prestart

        demo_servers_prestart()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)

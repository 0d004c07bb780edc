"""The live side of upstreams: the pool of sessions that the executor runs calls on (pool.py, on the loop of
loop.py), how each connects (spec.py, stdio.py, launch.py; prestart.py: servers started before the gateway's
imports, which the pool adopts), what it sends (requests.py), relays (relay.py) and finds out about its health
(health.py), and the guards on what goes out and comes back (egress.py, reply_depth.py, scrub.py)."""

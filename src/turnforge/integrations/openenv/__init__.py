"""turnforge envs as OpenEnv environments, and OpenEnv environments as turnforge envs (needs `turnforge[openenv]`).

    turnforge env serve --env household --split test --port 8001          # server.py (openenv's own server code)
    turnforge eval --env openenv:http://127.0.0.1:8001 --policy random --out runs/remote   # remote.py

`models.py` holds the action / observation / state models both sides share.
"""

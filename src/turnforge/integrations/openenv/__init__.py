"""turnforge envs as OpenEnv environments (needs `turnforge[openenv]`).

    turnforge env serve --env household --split test --port 8001          # server.py (openenv's own server code)

`models.py` holds the action / observation / state models of the server. The other direction, an OpenEnv server as
a turnforge env (`--env openenv:URL`), is an env family: `turnforge.envs.openenv_url`.
"""

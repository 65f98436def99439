"""The episode viewer (`turnforge view`): a local web page over a run's episode files.

    episodes.py   EpisodeFile (byte-offset index, filters, paging), episode_view (turns, loss mask)
    server.py     Viewer, make_server: the standard library's HTTP server, page.html and three JSON routes
"""

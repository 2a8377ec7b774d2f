"""Serving: `captioner serve`'s local demo page.

    server.py         the FastAPI app: upload a photo, see its caption, n-best and attention (page_options)
    limits.py         what the server refuses, before a request costs memory, disk or CPU
    serve_page.html   the page
"""

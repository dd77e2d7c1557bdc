"""The live dashboard on the HTTP port: GET / in a browser, or GET /dashboard.

``state.py`` gathers the host's state and cumulative traffic into one JSON
document, ``html.py`` renders the first page, ``assets.py`` holds the inline
style and script that poll the document and draw the charts, and ``rest.py``
mounts the routes. The page loads nothing from anywhere else.
"""

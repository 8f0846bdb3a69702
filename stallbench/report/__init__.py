"""The HTML report: ``report.render.render(result_paths, out)`` turns result files into one
self-contained page.

Nothing is imported here: ``report.tables`` (the terminal tables every command prints) must not
pull in ``render`` and with it matplotlib (~0.5 s, and more on a busy machine) at each CLI start.
"""

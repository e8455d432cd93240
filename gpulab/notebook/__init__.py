"""What a notebook uses around its lesson code: the template helpers (`lesson`: the opening line,
`show_source`, self-checks, "What you saw") and the widget panel with its controls (`widgets`).
"""

"""Streamlit helpers shared by the pages: charts, widgets, URL state, the training workers' UI side.

A regular package (not a namespace one): Streamlit then watches only its .py files, not the
whole folder, so files written into its __pycache__ never show a "File change" notice.
"""

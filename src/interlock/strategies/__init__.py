"""The runtime: Strategy and the parts it owns.

Importing this package imports torch; `import interlock` alone does not.
"""

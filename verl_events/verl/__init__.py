"""verl glue: the classes and methods of verl the bridge turns into stages."""

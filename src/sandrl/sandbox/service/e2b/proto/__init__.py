"""Python code generated from sandrl's envd .proto files (see gen.sh); do not edit by hand."""

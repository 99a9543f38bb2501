"""Sparrow's YAML configuration, installed as the data package sparrow_conf."""

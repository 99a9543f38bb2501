"""Package discovery: the code packages plus conf/, installed as the data package sparrow_conf."""

from setuptools import find_packages, setup

CODE = ["sparrow_core*", "storage*", "runtime*", "reports*", "tasks*", "pipelines*", "sparrow_cli*"]

setup(
    packages=find_packages(include=CODE) + ["sparrow_conf"],
    package_dir={"sparrow_conf": "conf"},
    package_data={
        "sparrow_conf": ["*.yaml", "*/*.yaml"],
        "sparrow_core": ["assets/*/*"],
    },
)

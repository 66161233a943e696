"""The executor: carries out authorized commands exactly once, fenced and keyed."""

"""placeholder"""
def install() -> None:
    return None

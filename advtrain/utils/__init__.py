"""Foundations shared by the library; imports no other advtrain package."""

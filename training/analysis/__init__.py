"""Looking inside training beside the step: the Hessian's top eigenvalue (curvature), loss landscapes around a
checkpoint, and μP's coordinate check. Imports config/ and step/."""
